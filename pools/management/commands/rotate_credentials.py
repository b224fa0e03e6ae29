"""`python manage.py rotate_credentials` (SPEC §3): re-encrypt every stored upstream credential under
the first key of GATEWAY_CREDENTIALS_KEY.

Rotation: put the new key first (`GATEWAY_CREDENTIALS_KEY=new,old`) on every node, run this, then
drop the old key. Each row is rewritten only if it still holds the token that was read (a credential
changed in admin meanwhile is kept); every node uses the new token on its next request (the write
moves the config version). A credential no key decrypts is named and left as it is.
"""

from cryptography.fernet import Fernet
from django.core.management.base import BaseCommand, CommandError

from pools.services import CredentialRotation, credentials_rotate


class Command(BaseCommand):
    help = "Re-encrypt every stored upstream credential under the first key of GATEWAY_CREDENTIALS_KEY."

    def add_arguments(self, parser):
        parser.add_argument(
            "--new-key",
            action="store_true",
            help="Only print a new key to put first in GATEWAY_CREDENTIALS_KEY.",
        )

    def handle(self, *args, **options):
        if options["new_key"]:
            self.stdout.write(Fernet.generate_key().decode())
            return
        result: CredentialRotation = credentials_rotate()
        if result.key_missing:
            raise CommandError("GATEWAY_CREDENTIALS_KEY is not set: nothing can be decrypted or encrypted.")
        self.stdout.write(f"{result.rotated} credentials re-encrypted under the first key")
        if result.unreadable:
            raise CommandError(
                "no key of GATEWAY_CREDENTIALS_KEY decrypts the credential of: "
                + ", ".join(result.unreadable)
            )
