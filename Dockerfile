# One image for every privnet container: agents (the default command) and the orchestrator
# (`privnet run ...`). docker-compose.yml runs 1 broker, 1 orchestrator and N agents from it,
# and `privnet run --runtime docker` its broker-less agents.
#
# The first stage builds the wheel (`pip wheel .`, the same build as on the host); the image
# installs that wheel, so containers run exactly what `pip install privnet-*.whl` installs.
# The sources come without .git, so setuptools-scm cannot read the version from a tag: it is
# PRIVNET_VERSION when given (`privnet run --runtime docker` passes the host's), else
# pyproject.toml's fallback_version (the last release).
FROM python:3.11-slim AS wheel
ARG PRIVNET_VERSION=
WORKDIR /src
COPY pyproject.toml README.md ./
COPY privnet ./privnet
RUN if [ -n "$PRIVNET_VERSION" ]; then export SETUPTOOLS_SCM_PRETEND_VERSION="$PRIVNET_VERSION"; fi \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    MPLBACKEND=Agg \
    MPLCONFIGDIR=/tmp/matplotlib

# The user every process runs as; uid 1000 is the usual first user on a Linux host.
RUN groupadd --gid 1000 privnet \
    && useradd --uid 1000 --gid privnet --create-home --shell /usr/sbin/nologin privnet

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so editing the code does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY --from=wheel /dist /tmp/dist
RUN pip install --no-deps /tmp/dist/privnet-*.whl \
    && rm -rf /tmp/dist pyproject.toml \
    && mkdir runs && chown privnet:privnet runs

# Started as root (compose does this for the orchestrator), the entrypoint only makes the
# mounted /app/runs writable, then drops to its owner (or to privnet); never runs as root.
COPY docker-entrypoint.sh /usr/local/bin/privnet-entrypoint
USER privnet
ENTRYPOINT ["privnet-entrypoint"]
CMD ["python", "-m", "privnet.agent"]
