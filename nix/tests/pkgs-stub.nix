# A stand-in for the few `pkgs` builders nix/module.nix uses.  Each returns a
# record of what it was given that also turns into a fake store path in
# strings, so the tests can look inside (tests/repo/test_nix.py).
let
  drv =
    kind: name: extra:
    extra
    // {
      _stub = kind;
      inherit name;
      __toString = _: "/nix/store/00000000000000000000000000000000-${name}";
    };
in
{
  writeText = name: text: drv "writeText" name { inherit text; };
  linkFarm = name: entries: drv "linkFarm" name { inherit entries; };
  callPackage = _fn: args: drv "package" "rqsys" { inherit args; };
  jq = drv "package" "jq" { };
}
