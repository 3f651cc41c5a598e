"""The server's Prometheus metrics (prometheus_client), served as text at /metrics.

Each server has a registry of its own, so that several can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Decode steps of the megakernel take about a millisecond: buckets start well below that.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
                   0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0)


class Metrics:
    def __init__(self, batch_size: int, max_queue: int):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("megakernel_requests", "Requests by outcome: ok, cancelled (the client went "
                                "away), error (500), bad_request (400), rejected (503: queue full or "
                                "engine stopped)", ["outcome"], registry=r)
        self.prompt_tokens = Counter("megakernel_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("megakernel_generation_tokens", "Tokens generated", registry=r)
        self.queue_depth = Gauge("megakernel_queue_depth", "Sequences waiting for a slot", registry=r)
        self.running = Gauge("megakernel_running_sequences", "Sequences holding a slot of the batch", registry=r)
        Gauge("megakernel_batch_slots", "Slots of the running batch (--max-num-seqs)", registry=r).set(batch_size)
        self.bucket = Gauge("megakernel_batch_bucket", "The compiled batch the last decode launch ran: the "
                            "smallest that holds the running sequences", registry=r)
        self.launch_steps = Gauge("megakernel_steps_per_launch", "Decode steps the last launch ran (several "
                                  "while nobody waits for a slot)", registry=r)
        Gauge("megakernel_queue_limit", "Sequences the queue holds before answering 503", registry=r).set(max_queue)
        self.engine_errors = Counter("megakernel_engine_errors", "Failed decode steps or prefills (each "
                                     "failed the requests in flight and reset the batch)", registry=r)
        self.ttft = Histogram("megakernel_time_to_first_token_seconds", "From a request's arrival to its "
                              "first token", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("megakernel_inter_token_latency_seconds", "Between successive tokens of a "
                             "sequence", buckets=LATENCY_BUCKETS, registry=r)
        self.step = Histogram("megakernel_decode_step_seconds", "One decode step of the running bucket, "
                              "sampling included (a launch of several steps: its time over its steps)",
                              buckets=LATENCY_BUCKETS, registry=r)
        # the first token's wait, in parts: for the prefill that admits the request, then that prefill
        self.queue_time = Histogram("megakernel_request_queue_time_seconds", "From a request's arrival to the "
                                    "start of the packed prefill that admits its prompt (once a prompt)", buckets=TTFT_BUCKETS, registry=r)
        self.prefill = Histogram("megakernel_prefill_seconds", "One packed admission prefill of the prompts "
                                 "that arrived together, their first tokens included", buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.e2e = Histogram("megakernel_request_latency_seconds", "From a request's arrival to its last "
                             "token", buckets=TTFT_BUCKETS, registry=r)
        for outcome in ("ok", "cancelled", "error", "bad_request", "rejected"):
            self.requests.labels(outcome)     # every series exists from the start, at 0

    def render(self) -> bytes:
        return generate_latest(self.registry)
