"""RedisProgramCache: connection, record format, cross-host lock, fleet counters."""
