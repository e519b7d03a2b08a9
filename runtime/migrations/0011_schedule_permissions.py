"""Reading schedules needs a permission of its own (a schedule's input is what its runs start
with, and may hold customers' data): "viewers" and "operators" get ``view_schedule``.
Managing schedules (``manage_schedule``, which includes authorizing side effects ahead of time)
is given to people one by one."""

from django.db import migrations

GROUPS = {"viewers": [("runtime", "view_schedule")], "operators": [("runtime", "view_schedule")]}


def grant(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after migrate; these groups need them now.
    for config in apps.get_app_configs():
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for name, perms in GROUPS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        for app, codename in perms:
            group.permissions.add(permission_model.objects.get(
                content_type__app_label=app, codename=codename))


def revoke(apps, schema_editor):
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for name, perms in GROUPS.items():
        group = group_model.objects.filter(name=name).first()
        if group is None:
            continue
        for app, codename in perms:
            group.permissions.remove(*permission_model.objects.filter(
                content_type__app_label=app, codename=codename))


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0010_schedules_and_expiry"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
