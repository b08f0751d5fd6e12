"""Reading runs back: evaluation of snapshots (`evaluate`), plots (`plot`) against the
published reference curves (`references`, data in ``data/``), and the replay's
rate-limiter report of which side waits (`bottleneck`).
"""
