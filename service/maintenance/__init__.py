"""Maintenance windows: when one opens, and what opening it does.

schedule.py  Maintenance: APScheduler jobs that say when each window opens and closes
windows.py   MaintenanceWindows: what an opening does to the services, and the API's view
"""
