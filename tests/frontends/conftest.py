"""The front ends' tests run with JAX's 64-bit mode (PyTensor's floatX is float64); each module restores the
flag for the test modules that share its process."""
import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def x64():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
