# A stand-in for the few nixpkgs `lib` functions nix/module.nix and
# nix/package.nix use, so they can be evaluated without nixpkgs
# (tests/repo/test_nix.py).  Option types carry a `check`; submodule, nullOr,
# either, listOf and attrsOf say what they wrap.
let
  type = name: check: { inherit name check; };
  isPathLike =
    v:
    builtins.isPath v
    || (builtins.isString v && builtins.substring 0 1 v == "/")
    || (builtins.isAttrs v && v ? __toString);
in
rec {
  mkOption = attrs: attrs // { _type = "option"; };
  mkEnableOption =
    what:
    mkOption {
      type = types.bool;
      default = false;
      description = "Whether to enable ${what}.";
    };
  mkIf = condition: content: {
    _type = "if";
    inherit condition content;
  };
  mkMerge = contents: {
    _type = "merge";
    inherit contents;
  };

  nameValuePair = name: value: { inherit name value; };
  mapAttrs' = f: set: builtins.listToAttrs (map (n: f n set.${n}) (builtins.attrNames set));
  mapAttrsToList = f: set: map (n: f n set.${n}) (builtins.attrNames set);
  filterAttrs =
    pred: set:
    builtins.listToAttrs (
      builtins.concatMap (n: if pred n set.${n} then [ (nameValuePair n set.${n}) ] else [ ]) (
        builtins.attrNames set
      )
    );
  optional = cond: x: if cond then [ x ] else [ ];
  optionalAttrs = cond: set: if cond then set else { };
  hasPrefix = pre: s: builtins.substring 0 (builtins.stringLength pre) s == pre;

  # For nix/package.nix.
  hasSuffix =
    suf: s:
    let
      n = builtins.stringLength s;
      m = builtins.stringLength suf;
    in
    n >= m && builtins.substring (n - m) m s == suf;
  optionals = cond: xs: if cond then xs else [ ];
  versionAtLeast = v: least: builtins.compareVersions v least >= 0;
  cleanSourceWith = { src, filter }: toString src; # a string: never copied into a store
  licenses.mit = "mit";
  platforms.linux = [ "x86_64-linux" "aarch64-linux" ];

  types = {
    bool = type "bool" builtins.isBool;
    str = type "str" builtins.isString;
    path = type "path" isPathLike;
    package = type "package" (v: builtins.isAttrs v && v ? __toString);
    attrs = type "attrs" builtins.isAttrs;
    port = type "port" (v: builtins.isInt v && v >= 0 && v <= 65535);
    strMatching = re: type "string matching ${re}" (v: builtins.isString v && builtins.match re v != null);
    ints.between =
      lo: hi:
      type "integer between ${toString lo} and ${toString hi}" (
        v: builtins.isInt v && v >= lo && v <= hi
      );
    enum = values: type "one of ${builtins.toJSON values}" (v: builtins.elem v values);
    nullOr = t: type "null or ${t.name}" (v: v == null || t.check v) // { inner = t; };
    either = a: b: type "${a.name} or ${b.name}" (v: a.check v || b.check v) // { either = [ a b ]; };
    listOf = t: type "list of ${t.name}" builtins.isList // { elem = t; };
    attrsOf = t: type "attribute set of ${t.name}" builtins.isAttrs // { elem = t; };
    submodule = m: type "submodule" builtins.isAttrs // { inherit (m) options; };
  };
}
