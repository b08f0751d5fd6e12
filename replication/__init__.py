"""replication package."""
