"""What may be shown of a launch's environment and command lines: secrets masked, by a
variable's or flag's name (HF_TOKEN, --hub_token) and by what a value holds (a URL's password,
token shapes, a connection string's key, a Bearer token, sshpass's `-p`). `--dry-run`, the run
directory's env.txt and run.json, and the deepspeed backend's choice of what stays off pdsh's
command line (`holds_secret`) all read these rules.

    >>> masked({"HF_TOKEN": "hf_x", "PIP_INDEX_URL": "https://ci:pw@pypi.example/simple"})
    {'HF_TOKEN': '***', 'PIP_INDEX_URL': 'https://ci:***@pypi.example/simple'}
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL"
    r"|(?:^|[_-])(?:KEY|KEYS|PAT|PASS|PWD|AUTH|COOKIE|SIGNATURE)(?:[_-]|$)",
    re.IGNORECASE,
)
"""A variable or flag name whose value is secret (HF_TOKEN, AZURE_STORAGE_KEY, GITHUB_PAT,
SSH_PASSPHRASE, OPENAI_APIKEY, --hub_token, ...)."""
TOKEN_VALUE = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|glpat-[A-Za-z0-9_-]{20,})"
)
"""Values that are tokens whatever they are called (Hugging Face, GitHub, OpenAI-style, AWS
access key ids, Slack, GitLab)."""
URL_PASSWORD = re.compile(
    r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?!\d*(?:[/?#]|$))\S+(@)", re.IGNORECASE
)
"""The password in `scheme://user:password@host` (PIP_INDEX_URL, a git remote, a proxy): all up
to the last `@`, since a password may hold `@` or `/` unescaped (`postgres://u:p@ss@db`). In
`https://host:8443/repo@v1` the digits before the path are a port, and nothing is masked."""
DSN_PASSWORD = re.compile(r"(?<![^\s='\"])([\w.+-]+:)(?!//)\S+(@(?:[a-z][a-z0-9]*\(|/))")
"""The password in a scheme-less DSN, as Go's MySQL driver takes them: `user:pw@tcp(db:3306)/x`,
`user:pw@unix(/run/mysqld.sock)/x`, `user:pw@/x`, where a word or an `=` value starts. A plain
`user:pw@host` is not taken: it reads as an image's `name:tag@sha256:...` as well."""
CONNECTION_STRING_SECRET = re.compile(
    r"(?<!\w)((?:AccountKey|SharedAccessKey|SharedAccessSignature|Password)=)[^;\s]+",
    re.IGNORECASE,
)
"""A key's value in a `Name=value;...` connection string (Azure storage and Service Bus,
ADO.NET): up to the next `;`."""
AUTHORIZATION = re.compile(r"(\b(?:Authorization:\s*\w+|Bearer)\s+)[^\s\"',;]+", re.IGNORECASE)
"""An HTTP credential: `Bearer <token>`, `Authorization: Basic <base64>`."""
WORDS = re.compile(r"(\s+)")
"""A value read as a command line: its words, and the spaces between them kept as they are."""
SSHPASS = "sshpass"
SSHPASS_OPTIONS_WITH_VALUE = ("-f", "-d", "-P")
"""sshpass's options that take the next word (`-P assword:`): that word is not yet the command
sshpass runs, whose own `-p` is no password of sshpass's."""
MYSQL_CLIENTS = ("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mariadb", "mariadb-dump")
"""Programs whose `-pPASSWORD` (attached) is a password."""
MASK = "***"


def is_secret(name: str) -> bool:
    return bool(SECRET.search(name))


def mask_value(value: str) -> str:
    """`value` with the credentials in it masked (a URL's or DSN's password, known token shapes,
    a connection string's key, a Bearer token). A value with spaces is read as a command line
    too (a ProxyCommand, `bash -c '...'`): its words are masked as `masked_argv` masks them.

    >>> mask_value("https://ci:s3cr3t@pypi.example/simple")
    'https://ci:***@pypi.example/simple'
    >>> mask_value("sshpass -p s3cr3t ssh -p 2222 jump")
    'sshpass -p *** ssh -p 2222 jump'
    """
    shown = value
    if "@" in shown:  # what both need; a long list without one (NO_PROXY) is not searched
        shown = URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", shown)
        shown = DSN_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", shown)
    shown = CONNECTION_STRING_SECRET.sub(rf"\g<1>{MASK}", shown)
    shown = AUTHORIZATION.sub(rf"\g<1>{MASK}", shown)
    shown = TOKEN_VALUE.sub(MASK, shown)
    parts = WORDS.split(shown)
    if len(parts) == 1:
        return shown
    # Words at even places, the spaces between them at odd ones: kept as they were.
    parts[::2] = masked_argv(parts[::2])
    return "".join(parts)


def holds_secret(name: str, value: str) -> bool:
    """Whether a variable shows a secret: by its name, or in its value."""
    return is_secret(name) or mask_value(value) != value


def masked(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else mask_value(v)) for k, v in env.items()}


def short_p_passwords(argv: list[str] | tuple[str, ...]) -> dict[int, str]:
    """The words of `argv` that hold a password given with `-p`, by index, as they are shown.

    `-p` is a password only for sshpass (`-p PW` or `-pPW`, among its options before the command
    it runs) and MySQL's clients (`-pPW`; in `-p WORD`, WORD is the database and the password is
    asked for). Everywhere else it is no secret and stays shown: a port for ssh (trainfleet's own
    `-p 2222` in PDSH_SSH_ARGS_APPEND), a path for mkdir, a published port for docker.

    >>> short_p_passwords(["sshpass", "-p", "pw", "ssh", "-p", "22", "host"])
    {2: '***'}
    """
    passwords: dict[int, str] = {}
    index = 0
    while index < len(argv):
        # The program's name, also as a path or as the value of an option that runs it
        # (`-oProxyCommand=sshpass ...`).
        program = re.split(r"[/=]", argv[index])[-1]
        index += 1
        if program in MYSQL_CLIENTS:
            for at in range(index, len(argv)):
                if argv[at].startswith("-p") and len(argv[at]) > 2:
                    passwords[at] = f"-p{MASK}"
        elif program == SSHPASS:
            while index < len(argv) and argv[index].startswith("-"):
                option = argv[index]
                if option == "-p" and index + 1 < len(argv):
                    passwords[index + 1] = MASK
                    index += 1
                elif option.startswith("-p") and len(option) > 2:
                    passwords[index] = f"-p{MASK}"
                elif option in SSHPASS_OPTIONS_WITH_VALUE:
                    index += 1
                index += 1
    return passwords


def masked_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line as it may be shown or written down: the value of a secret-named flag
    (`--hub_token X`, `--hub_token=X`), a password given with `-p` where `-p` means one
    (`short_p_passwords`) and every credential-shaped value masked.

    >>> masked_argv(["train.py", "--hub_token", "hf_abc", "--lr=1e-5", "--api-key=x"])
    ['train.py', '--hub_token', '***', '--lr=1e-5', '--api-key=***']
    """
    passwords = short_p_passwords(argv)
    shown: list[str] = []
    secret_next = False
    for index, word in enumerate(argv):
        if secret_next or index in passwords:
            shown.append(passwords.get(index, MASK))
            secret_next = False
            continue
        flag, eq, _ = word.partition("=")
        if word.startswith("-") and is_secret(flag.lstrip("-")):
            if eq:
                shown.append(f"{flag}={MASK}")
            else:
                shown.append(word)
                secret_next = True
            continue
        shown.append(mask_value(word))
    return shown
