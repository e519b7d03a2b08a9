from django.urls import path

from demo import views

app_name = "demo"
urlpatterns = [
    path("world/", views.outside_world, name="world"),
    path("notifications/", views.notifications, name="notifications"),
    path("notifications/hook/", views.notification_hook, name="notification-hook"),
]
