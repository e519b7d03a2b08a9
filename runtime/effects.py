"""What a tool call does to the world, one enum wherever it is named: the ``@tool`` decorator,
the step and approval rows, the loop's interruption contract, the console and the API.

``read_only``: running it again changes nothing, so an interrupted call is simply redone.
``side_effect``: it may have changed the world (a charge, a push, an email), so an interrupted
call waits for a person. Importable before Django's apps are ready (``runtime.agents`` needs
it there).
"""

from __future__ import annotations

from typing import Literal

from django.db.models import TextChoices


class Effect(TextChoices):
    READ_ONLY = "read_only"
    SIDE_EFFECT = "side_effect"


# The values ``@tool(effect=...)`` accepts, for type checkers (a test keeps it equal to
# ``Effect.values``).
EffectName = Literal["read_only", "side_effect"]
