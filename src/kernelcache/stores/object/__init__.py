"""ObjectStoreProgramCache: S3, GCS, Azure (and local directories) through obstore."""
