"""The dashboard's page, script and stylesheet, served from the package by ``service.api.ui``.

Plain files, no build step: ``index.html`` (a template with ``{{version}}``), ``app.js``
(vanilla JavaScript reading ``/api``) and ``style.css``. Nothing is loaded from a CDN.
"""
