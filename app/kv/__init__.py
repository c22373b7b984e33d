"""KV buckets (ADR-8): the service, its models, the watch feeds, the key cache, and how an
entry becomes an HTTP answer (``http``, shared by the router and the lean read path)."""
