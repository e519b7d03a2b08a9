"""A small example agent, registered by default so ``manage.py runagent hello`` works."""

from runtime import Agent, FinalAnswer, ScriptedLLM, ToolCall, ToolContext, tool


@tool(effect="read_only")
def look_up_greeting(language: str) -> str:
    """Return the greeting word for a language."""
    return {"en": "Hello", "fr": "Bonjour", "de": "Hallo"}.get(language, "Hello")


@tool(effect="side_effect")
def send_greeting(ctx: ToolContext, name: str, greeting: str) -> dict:
    """Pretend to send a greeting; a real tool would pass ctx.idempotency_key along."""
    return {"sent": f"{greeting}, {name}!", "key": ctx.idempotency_key}


def _script(transcript):
    done = len(transcript.entries)
    name = (transcript.input or {}).get("name", "world")
    if done == 0:
        return ToolCall("look_up_greeting", {"language": transcript.input.get("language", "en")})
    if done == 1:
        return ToolCall("send_greeting", {"name": name, "greeting": transcript.entries[0].result})
    return FinalAnswer(transcript.entries[-1].result)


hello = Agent("hello", ScriptedLLM(_script), [look_up_greeting, send_greeting])
