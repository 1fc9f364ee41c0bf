"""The server's Prometheus metrics (prometheus-client), one registry per server so that tests can run several.

    m = Metrics(slots=8)
    m.requests.labels(status="200").inc(); m.ttft.observe(0.12)
    text, content_type = m.render()    # GET /metrics

Names (all prefixed jaxspec_): requests_total{status}, prompt_tokens_total, completion_tokens_total, queue_length,
active_slots, slots, time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds,
draft_tokens_total (proposed), accepted_tokens_total (accepted); acceptance is accepted_tokens_total /
draft_tokens_total; verifications_total (the rows' verify calls: tau, tokens per verify call, is
(accepted_tokens_total + verifications_total) / verifications_total). Under the verification budget (budget.py):
step_cost_seconds{rows, gamma} (the step-cost curves c(R, k) warmup measured, refined by the steps served) and
steps_total{gamma} (the steps each tier ran; gamma 0: plain).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
            10.0, 30.0)
_E2E = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class Metrics:
  """Counters, gauges and histograms of one server."""

  def __init__(self, slots: int):
    r = self.registry = CollectorRegistry()
    self.requests = Counter("jaxspec_requests", "Finished HTTP requests to the /v1 endpoints by status code.",
                            ["status"], registry=r)
    self.prompt_tokens = Counter("jaxspec_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
    self.completion_tokens = Counter("jaxspec_completion_tokens", "Tokens generated.", registry=r)
    self.queue_length = Gauge("jaxspec_queue_length", "Requests waiting for a slot.", registry=r)
    self.active_slots = Gauge("jaxspec_active_slots", "Slots decoding a request.", registry=r)
    self.slots = Gauge("jaxspec_slots", "Slots of the engine.", registry=r)
    self.slots.set(slots)
    self.ttft = Histogram("jaxspec_time_to_first_token_seconds", "From arrival to the first generated token.",
                          buckets=_LATENCY, registry=r)
    self.itl = Histogram("jaxspec_inter_token_latency_seconds", "Time per output token after the first (a step's "
                         "time spread over the tokens it gave the request).", buckets=_LATENCY, registry=r)
    self.e2e = Histogram("jaxspec_e2e_request_latency_seconds", "From arrival to the last token.", buckets=_E2E,
                         registry=r)
    self.drafted = Counter("jaxspec_draft_tokens", "Draft tokens proposed.", registry=r)
    self.accepted = Counter("jaxspec_accepted_tokens", "Draft tokens accepted by the target.", registry=r)
    self.step_cost = Gauge("jaxspec_step_cost_seconds", "The verification budget's step-cost curve: seconds of one "
                           "step decoding `rows` rows at draft length `gamma` (0: plain), measured in warm-up and "
                           "refined by the steps served.",
                           ["rows", "gamma"], registry=r)
    self.verifications = Counter("jaxspec_verifications", "Verify calls of the target over the requests' rows (loop "
                                 "iterations; tau = (accepted tokens + verifications) / verifications).", registry=r)
    self.steps = Counter("jaxspec_steps", "Engine steps by the draft length they ran (the verification budget's "
                         "tier, a table's entry or the fixed gamma; 0: plain).", ["gamma"], registry=r)

  def render(self) -> tuple[bytes, str]:
    return generate_latest(self.registry), CONTENT_TYPE_LATEST
