# Evaluates nix/module.nix without nixpkgs, the way the NixOS module system
# would for these options: checks the given services.rq settings against the
# declared option types, fills in defaults, calls the module with them and
# resolves mkIf/mkMerge.  The result is the module's `config` (stub
# derivations shown as records with their fake storePath), plus
# failedAssertions.  Usage:
#   nix-instantiate --eval --strict --json nix/tests/eval-module.nix \
#     --argstr settingsJson '{"enable": true, "queues": {...}}'
# (or, from Nix, with `settings` as an attribute set).
{
  settingsJson ? "{}",
  settings ? builtins.fromJSON settingsJson,
}:
let
  lib = import ./lib-stub.nix;
  pkgs = import ./pkgs-stub.nix;
  module = import ../module.nix;
  call = config: module { inherit config lib pkgs; };

  show = v: if builtins.isString v || builtins.isInt v || builtins.isBool v then builtins.toJSON v else builtins.typeOf v;

  coerce =
    path: t: v:
    if !(t.check v) then
      throw "The option `${path}' has a value of the wrong type: ${show v} is not a ${t.name}."
    else if t ? options then
      evalOptions path t.options v
    else if t ? inner then
      (if v == null then null else coerce path t.inner v)
    else if t ? either then
      coerce path (builtins.head (builtins.filter (a: a.check v) t.either)) v
    else if t ? elem && builtins.isList v then
      builtins.genList (i: coerce "${path}.[${toString i}]" t.elem (builtins.elemAt v i)) (
        builtins.length v
      )
    else if t ? elem then
      builtins.mapAttrs (n: coerce "${path}.${n}" t.elem) v
    else
      v;

  valueOf =
    path: o: vals: n:
    if vals ? ${n} then
      (if o.readOnly or false then throw "The option `${path}' is read-only." else coerce path o.type vals.${n})
    else if o ? default then
      o.default
    else
      throw "The option `${path}' is used but not defined.";

  evalOptions =
    path: opts: vals:
    let
      unknown = builtins.filter (n: !(opts ? ${n})) (builtins.attrNames vals);
      settable = lib.filterAttrs (n: o: !(o.readOnly or false) || vals ? ${n}) opts;
    in
    if unknown != [ ] then
      throw "The option `${path}.${builtins.head unknown}' does not exist."
    else
      builtins.mapAttrs (
        n: o:
        if o._type or null == "option" then
          valueOf "${path}.${n}" o vals n
        else
          evalOptions "${path}.${n}" o (vals.${n} or { })
      ) settable;

  dropped = {
    _type = "dropped";
  };
  isDropped = v: builtins.isAttrs v && v._type or null == "dropped";
  resolve =
    v:
    if builtins.isPath v then
      toString v
    else if builtins.isList v then
      map resolve v
    else if !(builtins.isAttrs v) then
      v
    else if v._type or null == "if" then
      (if v.condition then resolve v.content else dropped)
    else if v._type or null == "merge" then
      builtins.foldl' merge { } (builtins.filter (x: !isDropped x) (map resolve v.contents))
    else if v ? __toString then
      { storePath = toString v; } // resolve (removeAttrs v [ "__toString" ])
    else
      lib.filterAttrs (_: x: !isDropped x) (builtins.mapAttrs (_: resolve) v);
  merge = a: b: a // builtins.mapAttrs (n: bv: if a ? ${n} then mergeValues n a.${n} bv else bv) b;
  mergeValues =
    n: x: y:
    if builtins.isList x && builtins.isList y then
      x ++ y
    else if builtins.isAttrs x && builtins.isAttrs y && !(x ? storePath) then
      merge x y
    else if x == y then
      x
    else
      throw "conflicting definitions of ${n}";

  declared = (call (throw "options must not depend on config")).options.services.rq;
  cfg = evalOptions "services.rq" declared settings;
  out = resolve (call { services.rq = builtins.deepSeq cfg cfg; }).config;
  result = if isDropped out then { } else out;
in
result
// {
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) (result.assertions or [ ]));
}
