from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

from server.blas import limit_blas_threads


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_server_blas_threads_are_capped_and_zero_keeps_the_default() -> None:
    import numpy as np

    np.linalg.qr(np.eye(4))  # BLAS loaded
    before = _blas_threads()
    assert before
    try:
        limit_blas_threads(0)
        assert _blas_threads() == before
        limit_blas_threads(1)
        assert _blas_threads() == [1] * len(before)
    finally:
        threadpool_limits(limits=max(before), user_api="blas")
