"""FileStreamProgramCache: layout, read path, atomic writes, size cap, locks, tree safety."""
