"""coldbrew: an asyncio worker daemon for long-running jobs over RabbitMQ and PostgreSQL."""

from __future__ import annotations

from coldbrew.app import App, JobSpec
from coldbrew.batches import BatchRecord, Job
from coldbrew.client import Client
from coldbrew.context import Context
from coldbrew.errors import (
    BatchNotFound,
    BrokerUnavailable,
    ColdbrewError,
    ConfigurationError,
    ContractViolation,
    DatabaseUnavailable,
    JobNotFound,
    Permanent,
    Retry,
    ServiceUnavailable,
    Snooze,
)
from coldbrew.model import JobRecord, Status
from coldbrew.settings import Settings

__all__ = [
    "App",
    "BatchNotFound",
    "BatchRecord",
    "BrokerUnavailable",
    "Client",
    "ColdbrewError",
    "ConfigurationError",
    "Context",
    "ContractViolation",
    "DatabaseUnavailable",
    "Job",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "Permanent",
    "Retry",
    "ServiceUnavailable",
    "Settings",
    "Snooze",
    "Status",
]

__version__ = "0.1.0"
