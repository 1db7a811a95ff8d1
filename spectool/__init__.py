"""spectool: will speculative decoding make this model faster for our traffic, on our GPU?"""

__version__ = "0.1.0"
