"""Thread count of NumPy's BLAS/LAPACK in the server process.

The server shares its machine with the SuperLink (and, in simulation, with every client), and its
linear algebra is small (FeDLRT's QR of an n x 2r basis, SVD of a 2r x 2r matrix): there a
multi-threaded OpenBLAS spins its threads against the other processes and one 784 x 200 QR took
1 s instead of 0.08 s on a loaded 2-core machine (docs/performance.md)."""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def limit_blas_threads(threads: int) -> None:
    """Cap BLAS threads for the rest of the process; 0 keeps the library's default."""
    if threads > 0:
        threadpool_limits(limits=threads, user_api="blas")
