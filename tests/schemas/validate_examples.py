#!/usr/bin/env python3
"""Validates every JSON file under examples/ against the schema for its kind.

The kind follows from the folder (examples/models -> model.schema.json, ...).
HuggingFace configs (examples/models/hf/) are not our format and are checked by the
C++ importer tests instead. A JSON file in a folder with no schema is an error, so a new
kind of example cannot slip in unchecked.
"""
import json
import pathlib
import sys

import jsonschema

SCHEMA_FOR_FOLDER = {
    "models": "model.schema.json",
    "clusters": "cluster.schema.json",
    "jobs": "job.schema.json",
    "profiles": "profile.schema.json",
    "plans": "plan.schema.json",
}
NOT_OURS = {"hf"}  # third-party formats, validated by their importers


def schema_for(path: pathlib.Path, examples: pathlib.Path):
    parts = path.relative_to(examples).parts
    if any(part in NOT_OURS for part in parts[:-1]):
        return None
    for part in parts[:-1]:
        if part in SCHEMA_FOR_FOLDER:
            return SCHEMA_FOR_FOLDER[part]
    raise SystemExit(f"{path}: no schema is known for files in this folder")


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    examples = root / "examples"
    schemas = {}
    failures = 0
    checked = 0
    for path in sorted(examples.rglob("*.json")):
        schema_name = schema_for(path, examples)
        if schema_name is None:
            continue
        if schema_name not in schemas:
            schema_path = root / "schemas" / schema_name
            schemas[schema_name] = json.loads(schema_path.read_text())
            jsonschema.Draft202012Validator.check_schema(schemas[schema_name])
        validator = jsonschema.Draft202012Validator(schemas[schema_name])
        errors = sorted(validator.iter_errors(json.loads(path.read_text())), key=str)
        checked += 1
        for error in errors:
            failures += 1
            pointer = "/" + "/".join(str(p) for p in error.absolute_path)
            print(f"{path.relative_to(root)}: {pointer}: {error.message}")
    print(f"{checked} example files checked against their schemas")
    if checked == 0:
        print("no example files found")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
