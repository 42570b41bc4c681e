"""The farm-wide numbers: the dashboard's summary and the Prometheus exposition of /metrics.

Why apart from metrics.py: these add up the per-render and per-worker views metrics.py computes (one
home each) into totals, and speak prometheus_client; nothing else needs that library.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from coordinator.views.fleet import list_workers
from coordinator.views.metrics import MetricsStore, blob_sizes, shas_in, task_view


class SnapshotStore(MetricsStore, Protocol):
    """The store reads /metrics adds to the farm's numbers: how deep each queue is."""

    def queue_depths(self) -> dict[str, int]: ...

    def redis_health(self) -> dict: ...


def farm_snapshot(store: SnapshotStore, render_limit: int = 100) -> dict:
    """Farm-wide numbers over the newest renders: what /metrics and /api/metrics-summary report."""
    renders = store.list_renders(render_limit)
    tasks = [t for r in renders for t in store.render_tasks(r["id"])]
    sizes = blob_sizes(store, {s for t in tasks for f in ("inputs", "outputs") for s in shas_in(t.get(f))})
    views = [task_view(t, sizes) for t in tasks]
    stage_n: Counter = Counter()
    stage_s: Counter = Counter()
    for v in views:
        if v["display"] == "done" and isinstance(v["seconds"], (int, float)):
            stage_n[v["stage"]] += 1
            stage_s[v["stage"]] += float(v["seconds"])
    done = [v for v in views if v["display"] == "done"]
    return {
        "queue_depth": store.queue_depths(),
        "renders_by_state": dict(Counter(r["state"] for r in renders)),
        "tasks_by_state": dict(Counter(v["display"] for v in views)),
        "stage_seconds": {s: {"count": stage_n[s], "sum": stage_s[s]} for s in stage_n},
        "bytes_moved": {"in": sum(v["bytes_in"] for v in done), "out": sum(v["bytes_out"] for v in done)},
        "workers": list_workers(store),
        "redis": store.redis_health(),
    }


class FarmCollector:
    """A prometheus_client collector that reads the store on every scrape (no state of its own)."""

    def __init__(self, store: SnapshotStore, render_limit: int = 100) -> None:
        self.store = store
        self.render_limit = render_limit

    def collect(self):
        snap = farm_snapshot(self.store, self.render_limit)
        queue = GaugeMetricFamily(
            "farm_queue_depth", "Ready tasks per capability queue", labels=["capability"]
        )
        for cap, n in sorted(snap["queue_depth"].items()):
            queue.add_metric([cap], n)
        yield queue
        yield _gauge(
            "farm_tasks", "Tasks of recent renders by display state", "state", snap["tasks_by_state"]
        )
        yield _gauge("farm_renders", "Recent renders by state", "state", snap["renders_by_state"])
        moved = GaugeMetricFamily(
            "farm_bytes_moved_bytes",
            "Blob bytes read (in) and written (out) by done tasks of recent renders",
            labels=["direction"],
        )
        for direction, n in sorted(snap["bytes_moved"].items()):
            moved.add_metric([direction], n)
        yield moved
        stage = SummaryMetricFamily(
            "farm_stage_task_seconds", "Seconds per done task by stage", labels=["stage"]
        )
        for name, s in sorted(snap["stage_seconds"].items()):
            stage.add_metric([name], count_value=s["count"], sum_value=s["sum"])
        yield stage
        yield from _worker_families(snap["workers"])
        yield from _redis_families(snap["redis"])


def _gauge(name: str, doc: str, label: str, values: dict) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, n in sorted(values.items()):
        family.add_metric([str(key)], n)
    return family


def _worker_families(workers: list[dict]):
    done = CounterMetricFamily("farm_worker_tasks_done", "Tasks (tiles) done per worker", labels=["worker"])
    fails = CounterMetricFamily(
        "farm_worker_failures", "Failed or expired tasks per worker", labels=["worker"]
    )
    busy = CounterMetricFamily("farm_worker_busy_seconds", "Seconds spent holding leases", labels=["worker"])
    state = GaugeMetricFamily(
        "farm_worker_state", "1 for the worker's current state", labels=["worker", "state"]
    )
    for w in workers:
        done.add_metric([w["id"]], w["tasks_done"])
        fails.add_metric([w["id"]], w["failures"])
        busy.add_metric([w["id"]], w["busy_s"])
        state.add_metric([w["id"], w["state"]], 1)
    yield from (done, fails, busy, state)


def _redis_families(health: dict):
    """The replicated set's health (sentinel.replication_health): replicas online, each one's lag,
    sentinels that see the primary; a single server reports its replicas too (usually none)."""
    yield _gauge("farm_redis_up", "1 while the Redis primary answers", "mode",
                 {health.get("mode", "down"): int(health.get("mode") != "down")})
    lag = GaugeMetricFamily("farm_redis_replica_lag_seconds", "Seconds since each replica's last ack",
                            labels=["replica", "state"])
    for r in health.get("replicas", []):
        lag.add_metric([r["address"], r["state"]], r["lag_s"])
    yield lag
    yield GaugeMetricFamily("farm_redis_replicas_online", "Replicas in sync with the primary",
                            value=health.get("replicas_online", 0))
    if "sentinels" in health:
        yield GaugeMetricFamily("farm_redis_sentinels_seeing_primary", "Sentinels that name the same primary",
                                value=health["sentinels_seeing"])


def prometheus_text(store: SnapshotStore, render_limit: int = 100) -> bytes:
    """The /metrics body in the Prometheus text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FarmCollector(store, render_limit))
    return generate_latest(registry)
