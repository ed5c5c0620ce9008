{
  description = "rqsys: a reliable, filesystem-backed message queue for any Unix language, systemd-native";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      packages = forAllSystems (pkgs: rec {
        rqsys = pkgs.callPackage ./nix/package.nix { };
        default = rqsys;
      });

      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./nix/module.nix ];
          services.rq.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
        };

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ self.packages.${pkgs.stdenv.hostPlatform.system}.default ];
          packages = [
            pkgs.scdoc
            pkgs.mandoc
            pkgs.ruff
            pkgs.mypy
            pkgs.curl
            pkgs.python3Packages.pytest
          ];
        };
      });

      checks = forAllSystems (pkgs: {
        package = self.packages.${pkgs.stdenv.hostPlatform.system}.default;

        # Boot a VM with one queue, post a message with curl, wait for done.
        vm = pkgs.testers.runNixOSTest {
          name = "rqsys";
          nodes.machine = {
            imports = [ self.nixosModules.default ];
            environment.systemPackages = [ pkgs.curl ];
            services.rq = {
              enable = true;
              queues.hello = {
                script = pkgs.writeShellScript "hello" ''
                  echo "hello from $RQ_MSG_ID"
                  echo "done said hello to $RQ_PARAM1" >&3
                '';
                numWorkers = 2;
              };
            };
          };
          testScript = ''
            import json

            machine.wait_for_unit("sockets.target")
            machine.wait_for_unit("rq-scan.service")
            machine.wait_until_succeeds("test -f /var/lib/rq/queue/hello/config.json")
            machine.wait_for_open_port(3333)
            answer = machine.succeed(
                "curl -fsS --data-urlencode 'mesg={\"dest\": \"hello\", \"param1\": \"vm\"}'"
                " http://localhost:3333/q/hello/new_message"
            )
            status, url = json.loads(answer)
            assert status == "ok", answer
            machine.wait_until_succeeds(f"rq statusmesg --msg_id {url} | grep '^ok done - said hello to vm'")
            machine.succeed("grep -rq 'hello from' /var/lib/rq/queue/hello/done")
            machine.succeed("man -w rq rqsys rq-queue-script rqsys.json")
          '';
        };
      });
    };
}
