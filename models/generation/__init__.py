"""Generation with a key / value cache (models/generate.py is its face): the cache of one layer
(cache.py), a layer's attention while generating (attend.py), a model made ready to generate
(session.py), where rows end (stops.py)."""
