/*
 * The fake libthunder.so the fake artifact host serves (hack/fake_thunder/library.py
 * builds it with the machine's C compiler). Preloaded into a workload through
 * LD_PRELOAD, its constructor proves two things on one stderr line: that the dynamic
 * loader loaded it into this process, and that it read the claim's config.json at the
 * mounted path. It prints config.json's size and top-level key names, never a value
 * (authToken and claims hold the client's credential). It does nothing else: a missing
 * or unreadable config.json is reported on the same line and the process runs on.
 *
 * FAKE_LIBTHUNDER_CONFIG replaces the path for tests that run it outside a container;
 * the CDI spec never sets it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_PATH "/etc/thunder/config.json"
#define CONFIG_MAX 65536
#define KEYS_MAX 1024

static char config[CONFIG_MAX];

/* The process's command name (/proc/self/comm), "?" when unreadable. */
static void command_name(char *out, size_t size) {
  int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd < 0 ? -1 : read(fd, out, size - 1);
  if (fd >= 0) close(fd);
  if (n <= 0) n = 0;
  out[n] = '\0';
  out[strcspn(out, "\n")] = '\0';
  if (out[0] == '\0') snprintf(out, size, "?");
}

/* Append the top-level keys of the JSON object in text[0..len) to out, comma-separated.
 * Only names are copied (printable ASCII, no quotes); values are skipped unseen. */
static void top_level_keys(const char *text, size_t len, char *out, size_t size) {
  size_t used = 0, i = 0;
  int depth = 0;
  out[0] = '\0';
  while (i < len) {
    char c = text[i++];
    if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (c == '"') {
      size_t start = i;
      while (i < len && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      size_t end = i < len ? i : len;
      i++;
      size_t next = i;
      while (next < len && strchr(" \t\r\n", text[next])) next++;
      if (depth != 1 || next >= len || text[next] != ':') continue;
      if (used && used + 1 < size) out[used++] = ',';
      for (size_t k = start; k < end && used + 1 < size; k++) {
        unsigned char ch = (unsigned char)text[k];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') out[used++] = (char)ch;
      }
      out[used] = '\0';
    }
  }
}

__attribute__((constructor)) static void libthunder_loaded(void) {
  int saved_errno = errno;
  const char *path = getenv("FAKE_LIBTHUNDER_CONFIG");
  if (path == NULL || path[0] == '\0') path = CONFIG_PATH;
  char comm[64], keys[KEYS_MAX], line[KEYS_MAX + 512];
  command_name(comm, sizeof comm);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int n;
  if (fd < 0) {
    n = snprintf(line, sizeof line,
                 "libthunder (fake): preloaded into %s (pid %ld); %s not read: %s\n", comm,
                 (long)getpid(), path, strerror(errno));
  } else {
    size_t total = 0, kept = 0;
    ssize_t got;
    char spill[4096];
    while ((got = read(fd, kept < CONFIG_MAX ? config + kept : spill,
                       kept < CONFIG_MAX ? CONFIG_MAX - kept : sizeof spill)) > 0) {
      total += (size_t)got;
      if (kept < CONFIG_MAX) kept += (size_t)got;
    }
    close(fd);
    top_level_keys(config, kept, keys, sizeof keys);
    memset(config, 0, sizeof config);
    n = snprintf(line, sizeof line,
                 "libthunder (fake): preloaded into %s (pid %ld); %s read: %zu bytes, "
                 "keys: %s\n",
                 comm, (long)getpid(), path, total, keys[0] ? keys : "(none)");
  }
  if (n > 0) {
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
  }
  errno = saved_errno;
}
