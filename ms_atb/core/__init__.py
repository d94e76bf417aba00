"""The engine's pure-Python core: requests, continuous batching and the paged KV block manager.

Nothing under ms_atb.core imports MindSpore (a test imports it with MindSpore made unimportable):
the scheduler and the block manager are plain data structures, testable and simulable anywhere."""
