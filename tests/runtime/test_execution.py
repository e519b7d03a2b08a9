"""``runtime.loop.execution``: what it builds for the loop's commits."""

from __future__ import annotations

from datetime import UTC, datetime

from runtime.loop.execution import new_step
from runtime.models import Step, StepStatus


def test_a_new_step_is_the_step_the_model_s_keywords_build():
    at = datetime(2026, 12, 6, 3, 4, 5, 6, tzinfo=UTC)
    values = {"run_id": 7, "index": 3, "status": StepStatus.DECIDING,
              "idempotency_key": "run7-step3-abc", "started_at": at}
    built, reference = new_step(**values), Step(**values)
    fields = [f.attname for f in Step._meta.concrete_fields]
    assert [getattr(built, f) for f in fields] == [getattr(reference, f) for f in fields]
    assert built._state.adding and built.pk is None
    other = new_step(run_id=8, index=1)
    assert other.run_id == 8 and other.idempotency_key == "" and built.run_id == 7
