"""The defaults of indexing and searching, in one module that imports nothing: the library's options and the
command line's flags both read them, so they cannot drift apart (and ``tvr --help`` needs no torch to show them)."""

#: window length and stride, in seconds
DEFAULT_WINDOW = 10.0
DEFAULT_STRIDE = 5.0
#: the shortlist index kinds ``--ann`` takes
ANN_KINDS = ("auto", "flat", "ivf", "hnsw")
DEFAULT_ANN = "auto"
#: how an HNSW graph may store its vectors (``tvr.search.ann``); a manifest naming another was written by a newer tvr
HNSW_STORAGES = ("float32", "float16")
#: windows above which ``auto`` builds an HNSW graph instead of an exact index
AUTO_THRESHOLD = 50_000
#: dtypes the rerank state may be stored in
STATE_DTYPES = ("float32", "float16")
DEFAULT_STATE_DTYPE = "float32"
#: windows per shard: the unit a killed ``tvr index`` loses
SHARD_WINDOWS = 4096
#: results returned, and windows scored exactly by a head whose score is not indexable
DEFAULT_K = 10
DEFAULT_RERANK = 100
#: the preset names ``tvr index --model`` takes (their hub ids and sizes: ``tvr.models.dual_encoder.PRESETS``, which
#: ``tests/test_dual_encoder_search.py`` checks against this list)
DUAL_ENCODER_PRESETS = ("clip-b32", "clip-b16", "clip-l14", "siglip-base", "siglip2-base", "siglip-multilingual")
