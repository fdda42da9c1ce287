"""Test setup: verify every graph a pass emits; 8 host CPU devices for sharding tests."""
import os

os.environ.setdefault("JAXFORM_CHECK", "1")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
