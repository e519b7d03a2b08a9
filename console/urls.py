"""URL routes of the console."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from console import api, approvals, batch, metrics, runs, schedules, slack, views, workers

console_patterns = [
    path("", approvals.queue, name="queue"),
    path("pending-count/", approvals.pending_count, name="pending-count"),
    path("approvals/<int:pk>/", approvals.approval_detail, name="approval"),
    path("approvals/decide/", batch.decide_batch, name="decide-batch"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/<int:pk>/", runs.run_detail, name="run"),
    path("workers/", workers.worker_list, name="workers"),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path("schedules/new/", schedules.schedule_new, name="schedule-new"),
    path("schedules/<int:pk>/", schedules.schedule_detail, name="schedule"),
    path("schedules/<int:pk>/authorize/", schedules.schedule_authorize,
         name="schedule-authorize"),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls()),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("slack/interactions", slack.interactions, name="slack-interactions"),
    # Browsers ask for /favicon.ico on pages without an icon link (the admin's, error pages).
    path("favicon.ico", views.favicon),
    # The demo's outside world only where the demo runs (manage.py demo) or in development.
    *([path("demo/", include("demo.urls"))] if settings.CONSOLE_DEMO else []),
    path("", include((console_patterns, "console"))),
]
