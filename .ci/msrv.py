#!/usr/bin/env python3
"""Fails when a dependency needs a newer Rust than Cargo.toml's rust-version.

Walks the resolved graph of `cargo metadata --all-features` from this crate
through normal and build dependencies (what a user compiles; dev-dependencies
are ours alone) and compares every package's own `rust-version`.
"""
import json
import subprocess
import sys


def version(v):
    return tuple(int(x) for x in v.split("."))[:3] + (0,) * (3 - len(v.split(".")))


meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]
declared = packages[root].get("rust_version")
if not declared:
    sys.exit("Cargo.toml declares no rust-version")

seen, todo = set(), [root]
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        if kinds & {None, "build"} and dep["pkg"] not in seen:
            seen.add(dep["pkg"])
            todo.append(dep["pkg"])

too_new = sorted(
    (packages[p]["name"], packages[p]["version"], packages[p]["rust_version"])
    for p in seen
    if packages[p].get("rust_version")
    and version(packages[p]["rust_version"]) > version(declared)
)
for name, ver, rv in too_new:
    print(f"{name} {ver} needs Rust {rv}, above rust-version = {declared}", file=sys.stderr)
if too_new:
    sys.exit(1)
print(f"rust-version {declared} covers all {len(seen)} dependencies' declared minimums")
