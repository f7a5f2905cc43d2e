"""The settings of OCI registries (stores/bundle/registry.py): credentials, and the references
KERNELCACHE_BUNDLES may name."""

from __future__ import annotations

from kernelcache.config import urls


def oci_username() -> str | None:
    """``KERNELCACHE_OCI_USERNAME``: the user name given to an OCI registry that asks (with the password)."""
    from kernelcache import config

    return config.env_get("KERNELCACHE_OCI_USERNAME") or None


def oci_password() -> str | None:
    """``KERNELCACHE_OCI_PASSWORD``: the password (or access token) that goes with KERNELCACHE_OCI_USERNAME."""
    from kernelcache import config

    return config.env_get("KERNELCACHE_OCI_PASSWORD") or None


def oci_token() -> str | None:
    """``KERNELCACHE_OCI_TOKEN``: a registry bearer token, sent as it is to a registry that asks for one."""
    from kernelcache import config

    return config.env_get("KERNELCACHE_OCI_TOKEN") or None


def check_bundle_reference(entry: str) -> None:
    """ConfigError naming KERNELCACHE_BUNDLES when its ``oci://`` entry is not a reference."""
    from kernelcache import config

    try:
        urls.oci_reference(entry)
    except ValueError as exc:
        raise config.ConfigError(f"KERNELCACHE_BUNDLES: {exc}") from None
