"""Serving: the slot engine (continuous batching with speculative decoding inside the step; docs/serving.md).

    engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=8, max_input_length=256,
                        max_new_tokens=256)
    engine.warmup()
    first = engine.insert(engine.free_slots()[0], prompt_ids,
                          RequestSettings(max_tokens=64, sampling=jaxspec.Sampling(0.7), seed=1))  # the first token
    out = engine.step()   # out.tokens[slot]: this step's new tokens; out.finished / out.reasons
"""

from jaxspec.serving.budget import Budget
from jaxspec.serving.engine import InsertOutput, SlotEngine, StepOutput
from jaxspec.serving.requests import RequestSettings
from jaxspec.serving.table import SpeculationTable, TableEntry

__all__ = ["Budget", "InsertOutput", "RequestSettings", "SlotEngine", "SpeculationTable", "StepOutput", "TableEntry"]
