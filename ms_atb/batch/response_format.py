"""response_format, the OpenAI field that asks for JSON, as the SamplingParams field that asks for the same.

Both input formats take it (an OpenAI batch line's body, a line of our JSONL), beside the API's own fields
(structured_outputs as an object, guided_json, guided_regex, guided_grammar, guided_choice):
  {"type": "text"}                              no constraint
  {"type": "json_object"}                       any JSON object: structured_outputs {"json_object": true}
  {"type": "json_schema", "json_schema": {"name": str, "schema": {...}, "strict": bool, "description": str}}
                                                the schema: structured_outputs {"json": schema}
The output always follows the schema ("strict" changes nothing: decoding is constrained either way).
"""
from __future__ import annotations

import json

from ms_atb.sampling_params import STRUCTURED_FIELDS

FIELD = "response_format"
TYPES = ("text", "json_object", "json_schema")
JSON_SCHEMA_KEYS = ("name", "schema", "strict", "description")


def structured_fields(response_format) -> dict:
    """The SamplingParams fields response_format asks for; ValueError saying what is wrong with it."""
    rf = response_format
    if not isinstance(rf, dict) or rf.get("type") not in TYPES:
        raise ValueError(f"response_format must be an object whose type is one of {list(TYPES)}, got "
                         f"{json.dumps(rf)[:200]}")
    extra = sorted(set(rf) - {"type", "json_schema"})
    if extra or ("json_schema" in rf) != (rf["type"] == "json_schema"):
        raise ValueError(f"response_format of type {rf['type']!r} takes "
                         f"{['type', 'json_schema'] if rf['type'] == 'json_schema' else ['type']}, got {sorted(rf)}")
    if rf["type"] == "text":
        return {}
    if rf["type"] == "json_object":
        return {"structured_outputs": {"json_object": True}}
    spec = rf["json_schema"]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
        raise ValueError(f"response_format.json_schema must be an object with a string 'name' and a JSON Schema "
                         f"object 'schema', got {json.dumps(spec)[:200]}")
    extra = sorted(set(spec) - set(JSON_SCHEMA_KEYS))
    if extra or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise ValueError(f"response_format.json_schema takes {list(JSON_SCHEMA_KEYS)} ('strict' a bool), got "
                         f"{sorted(spec)}")
    return {"structured_outputs": {"json": spec["schema"]}}


def line_sampling(line_fields: dict, defaults: dict) -> dict:
    """The SamplingParams fields of one input line: the job's defaults, then the line's own fields with its
    response_format in their place. A line that gives a structured output constraint of its own (in any field)
    does not take the defaults' one: a request has one."""
    own = dict(line_fields)
    if FIELD in own:
        fields = structured_fields(own.pop(FIELD))
        given = sorted(set(own) & set(STRUCTURED_FIELDS))
        if fields and given:
            raise ValueError(f"response_format and {given} both ask for a structured output; give one")
        own.update(fields)
    if set(own) & set(STRUCTURED_FIELDS):
        defaults = {k: v for k, v in defaults.items() if k not in STRUCTURED_FIELDS}
    return {**defaults, **own}
