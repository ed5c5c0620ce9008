# Evaluates flake.nix's outputs against a stub nixpkgs (no network here):
# what each output is made of, the VM test's script, and the VM's
# services.rq settings run through nix/module.nix (eval-module.nix).
let
  flake = import ../../flake.nix;
  stubLib = import ./lib-stub.nix;
  lib = stubLib // {
    genAttrs =
      names: f:
      builtins.listToAttrs (
        map (name: {
          inherit name;
          value = f name;
        }) names
      );
    mkDefault = value: value;
  };
  pkgsFor =
    system:
    import ./pkgs-stub.nix
    // {
      stdenv.hostPlatform.system = system;
      callPackage = fn: _args: {
        callPackage = toString fn;
        __toString = _: "/nix/store/00000000000000000000000000000000-rqsys";
      };
      mkShell = args: args;
      testers.runNixOSTest = args: args;
      writeShellScript = name: text: {
        inherit name text;
        __toString = _: "/nix/store/00000000000000000000000000000000-${name}";
      };
      scdoc = "scdoc";
      mandoc = "mandoc";
      ruff = "ruff";
      mypy = "mypy";
      curl = "curl";
      python3Packages.pytest = "pytest";
    };
  nixpkgs = {
    inherit lib;
    legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] pkgsFor;
  };
  self = flake.outputs { inherit self nixpkgs; };
  system = "x86_64-linux";
  vm = self.checks.${system}.vm;
  machine = vm.nodes.machine;
  defaultModule = self.nixosModules.default {
    inherit lib;
    pkgs = pkgsFor system;
  };
in
{
  inputs = flake.inputs;
  systems = builtins.attrNames self.packages;
  packages = builtins.mapAttrs (_: p: p.callPackage) self.packages.${system};
  moduleImports = map toString defaultModule.imports;
  modulePackage = toString defaultModule.services.rq.package;
  devShellInputs = map toString self.devShells.${system}.default.inputsFrom;
  devShellPackages = self.devShells.${system}.default.packages;
  checks = builtins.attrNames self.checks.${system};
  vmName = vm.name;
  vmTestScript = vm.testScript;
  vmImports = map (m: builtins.typeOf m) machine.imports;
  vmScript = machine.services.rq.queues.hello.script.text;
  vmConfig = import ./eval-module.nix { settings = machine.services.rq; };
}
