"""Header dependency tracking (direct mode): the directive scan, digests and the racy-timestamp rule,
variants, manifests."""
