"""Compiling through the cache: the request, the flow (look-up, single flight, miss, store), batches,
the compiler runners, the stored metadata."""
