"""Tools: argument schemas from type hints, a required effect, and the optional context."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from runtime import InvalidArguments, ToolContext, tool
from runtime.agents.tools import Tool


class Address(BaseModel):
    street: str
    city: str


@tool(effect="side_effect", max_attempts=1, dispatches=True)
def ship(ctx: ToolContext, order_id: str, to: Address, speed: Literal["slow", "fast"] = "slow",
         insured: bool = False) -> dict:
    """Ship an order to an address."""
    ctx.dispatch()
    return {"order": order_id, "city": to.city, "speed": speed, "key": ctx.idempotency_key}


@tool(effect="read_only")
def total(values: list[int]) -> int:
    """Add numbers."""
    return sum(values)


def test_schema_comes_from_the_signature():
    schema = ship.json_schema()
    assert schema["required"] == ["order_id", "to"]
    assert set(schema["properties"]) == {"order_id", "to", "speed", "insured"}
    assert schema["properties"]["speed"]["enum"] == ["slow", "fast"]
    assert schema["additionalProperties"] is False
    spec = ship.spec()
    assert (spec.name, spec.description) == ("ship", "Ship an order to an address.")
    assert (ship.effect, ship.max_attempts, ship.dispatches, ship.takes_ctx) == (
        "side_effect", 1, True, True)
    assert (total.effect, total.max_attempts, total.takes_ctx) == ("read_only", 3, False)


def test_validation_coerces_nested_models_and_reports_every_error():
    kwargs = ship.validate({"order_id": "o1", "to": {"street": "1 Main", "city": "Oslo"}})
    assert isinstance(kwargs["to"], Address) and kwargs["speed"] == "slow"
    with pytest.raises(InvalidArguments) as err:
        ship.validate({"order_id": 5, "to": {"street": "x"}, "speed": "warp", "extra": 1})
    text = str(err.value)
    for fragment in ("order_id", "to.city", "speed", "extra"):
        assert fragment in text
    with pytest.raises(InvalidArguments, match="must be a JSON object"):
        total.validate(["not", "an", "object"])


def test_invoke_passes_the_context_only_to_tools_that_take_it():
    dispatched = []
    ctx = ToolContext(1, 2, 1, "key-1", "agent", _on_dispatch=lambda: dispatched.append(1))
    result = ship.invoke(ctx, ship.validate({"order_id": "o", "to": {"street": "s", "city": "c"}}))
    assert result["key"] == "key-1" and dispatched == [1]
    ctx.dispatch()  # a second dispatch in the same attempt records nothing more
    assert dispatched == [1]
    assert total.invoke(ctx, {"values": [1, 2]}) == 3
    assert total(values=[4]) == 4  # still callable as the plain function


def test_declaring_a_tool_wrongly_is_an_error_at_import_time():
    with pytest.raises(TypeError, match="effect"):
        tool(lambda x: x)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="effect must be"):
        Tool(lambda: None, effect="maybe")  # type: ignore[arg-type]

    def untyped(x):
        return x

    with pytest.raises(TypeError, match="needs a type hint"):
        tool(untyped, effect="read_only")
