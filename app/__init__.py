"""radt's dashboard core (read engine, runs, series and summaries, cache, figures, export).

Importing `app` stays light (the collectors use the catalogue); the Dash server is built on
first access of `app.server`, which is what `gunicorn 'radt.app:server'` asks for.
"""


def __getattr__(name: str):
    if name == "server":
        from radt.app.web.dashboard import create_app

        return create_app().server
    raise AttributeError(name)
