"""The house's metrics, which no door owns: the core's series (models, tenants, memory), the
inference gateway's model-server gauges, and the /metrics port. Each door adds its own
per-call series to the same registry (api/metrics.py, http/metrics.py)."""
