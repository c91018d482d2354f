"""The HTTP detection service: ``create_app(detector, ServiceConfig(...), ApiKeys...)``."""

from openstamp.service.app import create_app
from openstamp.service.auth import ApiKeys, check_bind, load_api_keys
from openstamp.service.config import ServiceConfig

__all__ = ["ApiKeys", "ServiceConfig", "check_bind", "create_app", "load_api_keys"]
