# Evaluates nix/package.nix without nixpkgs: buildPythonApplication returns
# its arguments, packages are their names.  tests/repo/test_nix.py checks the
# dependencies for a Python version and runs postInstall on real unit files.
{
  pythonVersion ? "3.12",
}:
let
  names = [
    "setuptools"
    "wheel"
    "cffi"
    "falcon"
    "waitress"
    "jsonschema"
    "pyinotify"
    "argon2-cffi"
    "croniter"
    "prometheus-client"
    "jeepney"
    "jinja2"
    "systemd"
    "pyasyncore"
  ];
  pythonPackages = builtins.listToAttrs (map (name: { inherit name; value = name; }) names) // {
    buildPythonApplication = args: args;
  };
in
import ../package.nix {
  lib = import ./lib-stub.nix;
  python3 = {
    inherit pythonVersion;
    pkgs = pythonPackages;
  };
  scdoc = "scdoc";
  coreutils = "/nix/store/00000000000000000000000000000000-coreutils";
}
