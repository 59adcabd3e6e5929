"""radt's dashboard core (configuration, metric catalogue, read-side queries, figures).

Importing `app` stays light (the collectors use the catalogue); the Dash server is built on
first access of `app.server`, which is what `gunicorn 'app:server'` asks for.
"""


def __getattr__(name: str):
    if name == "server":
        from app.dashboard import create_app

        return create_app().server
    raise AttributeError(name)
