"""``museum-search serve``: visitors ask from their own phones (a JSON API and one web page over
the core query pipeline). Needs fastapi, uvicorn, segno and python-multipart."""

from museum_search.serve.app import create_app

__all__ = ["create_app"]
