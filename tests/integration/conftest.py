from .test_cluster import cluster  # noqa: F401  (shared with test_subscriptions.py)
