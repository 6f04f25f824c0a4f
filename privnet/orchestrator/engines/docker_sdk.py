"""The docker SDK's internals privnet relies on, in one place (the SDK is imported where
used: it is an optional dependency). Nothing else in the project reads a private member of
a docker SDK object."""

from __future__ import annotations

from typing import Any


def service_logs(service: Any) -> Any:
    """A service's output (every task of it, on any node), followed, as a stream that can be
    closed: `Service.logs` of the SDK cannot be, and never ends by itself (not even once the
    service is removed); its container logs can, so this is the same request, wrapped so."""
    from docker.types.daemon import CancellableStream

    api = service.client.api
    url = api._url("/services/{0}/logs", service.id)
    params = {"follow": True, "stdout": True, "stderr": True}
    response = api._get(url, params=params, stream=True)
    return CancellableStream(api._get_result_tty(True, response, False), response)
