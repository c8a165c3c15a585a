"""Alembic environment of the results store.

The tuner runs migrations in code (tuner.store.engine.migrate): it passes an
open connection in config.attributes["connection"]. For development, the
alembic CLI also works with `-x url=sqlite:///some.db` (or sqlalchemy.url set
in an ini file), e.g. to autogenerate a new revision against the models; a
refused downgrade is one line there too (users: `tuner db downgrade REVISION`).
"""

from alembic import context
from alembic.util import CommandError
from sqlalchemy import create_engine, pool

from tuner.errors import TunerError
from tuner.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise CommandError("no database: pass -x url=... or set sqlalchemy.url")
    return url


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    except TunerError as exc:
        # A downgrade() refusing to delete data (tuner.store.downgrade), rolled back: alembic's CLI prints
        # a CommandError as one line ("FAILED: ..."), any other exception as a traceback.
        raise CommandError(str(exc)) from None
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
