"""Two groups to give people: "viewers" may read runs and approvals (arguments and results
can hold customer data, so reading needs a permission), "operators" may also decide approvals
and cancel runs."""

from django.db import migrations

VIEW = [("runtime", "view_run"), ("runtime", "view_approval"), ("runtime", "view_step"),
        ("runtime", "view_event"), ("runtime", "view_worker")]
OPERATE = [*VIEW, ("runtime", "decide_approval"), ("runtime", "cancel_run")]
GROUPS = {"viewers": VIEW, "operators": OPERATE}


def create_groups(apps, schema_editor):
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


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0007_protocol"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, remove_groups)]
