"""Credentials by reference, and the strict base every settings model shares.

A credential is never written into the configuration: it is a reference, ``env:VAR`` or
``file:/path``, resolved only when the part that needs it is built (an adapter at start-up).

Invariants: ``SecretRef`` holds the reference, never the value; ``resolve`` raises
``ConfigError`` naming the reference, never the value; ``Strict`` models refuse unknown keys
and are frozen, so settings are passed around without being copied or changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, field_validator, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


class ConfigError(ValueError):
    """The configuration is invalid; the message names each field and why."""


class Strict(BaseModel):
    """Unknown keys are errors; numbers are finite (``.inf`` and ``.nan`` are refused);
    instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SecretRef(Strict):
    """A credential by reference: ``env:VAR`` or ``file:/path``. Never a literal value.

    In YAML it is written as a plain string: ``api_key: env:RUNPOD_API_KEY``.
    """

    ref: str

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: object) -> object:
        return {"ref": value} if isinstance(value, str) else value

    @field_validator("ref")
    @classmethod
    def _check(cls, value: str) -> str:
        if not (value.startswith("env:") and len(value) > 4) and not (
            value.startswith("file:/") and len(value) > 6
        ):
            raise ValueError("must be a reference 'env:VAR' or 'file:/absolute/path', not a value")
        return value

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # As it is written in YAML: a string, not the object that holds it.
        schema: dict[str, Any] = {
            "type": "string",
            "pattern": r"^(env:.+|file:/.+)$",
            "description": "A credential by reference: env:VAR or file:/absolute/path.",
            "examples": ["env:RUNPOD_API_KEY", "file:/var/run/secrets/vk-provider/api-key"],
        }
        return schema

    def resolve(self) -> str:
        """Read the secret now. The error names the reference, never the value."""
        kind, _, target = self.ref.partition(":")
        if kind == "env":
            value = os.environ.get(target)
            if value is None:
                raise ConfigError(f"credential {self.ref}: environment variable is not set")
            return value
        try:
            return Path(target).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"credential {self.ref}: cannot read file ({exc.strerror})") from exc

    def __repr__(self) -> str:
        return f"SecretRef({self.ref!r})"
