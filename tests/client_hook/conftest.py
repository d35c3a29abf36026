"""Hook-test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ampscope import fused, native_read


@pytest.fixture(autouse=True, scope="session")
def compiles_at_normal_priority() -> Iterator[None]:
    """The fused kernel compiles at nice +19 so that it takes only what training leaves idle;
    in a suite of 4 processes on 2 cores nothing is ever idle, and a test waiting for a compile
    waited 245 s instead of ~60. Results do not depend on the priority; the test of the
    priority itself sets it back (test_fused, TestExit). Session scope: before the class
    fixtures that compile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused, "COMPILE_NICENESS", 0)
        yield


@pytest.fixture(autouse=True, scope="session")
def c_loop_built() -> None:
    """The C loop's library built before any test, as a run has it after its first second
    (``native_read.soon`` then answers at once): no test's every-step norms change path midway
    when a background build ends. The tests of torch's paths turn ``fused.NATIVE`` off; those
    of the build use directories of their own."""
    native_read.library()
