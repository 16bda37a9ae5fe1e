"""Who owns which partition: one server alone, or many through ZooKeeper."""

from .base import Coordinator, OwnershipListener
from .local import LocalCoordinator

__all__ = ["Coordinator", "LocalCoordinator", "OwnershipListener"]
