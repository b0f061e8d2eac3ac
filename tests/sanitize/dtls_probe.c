/* The sanitizer setup against dynamic TLS (issue: LeakSanitizer's tracer crashed at exit in
 * every sanitized run that had loaded hwloc's GPU plugins).
 *
 * GCC 12's sanitizer runtime intercepts __tls_get_addr and, for a new dynamic TLS block whose
 * address is 16 mod 4096, assumes glibc 2.19's layout (a header of two words just before the
 * block giving its start and size) and records the range the header names. Since glibc 2.25 a
 * dynamic TLS block is a plain malloc'd chunk: from ASan's allocator, a chunk at offset 16 in a
 * page is common (its 16-byte chunk header sits at the page start), and the "header" is ASan's
 * own chunk header. At exit the leak check scans that bogus range and the tracer faults. Which
 * process meets it depends on how many modules with TLS it loads and on its allocations.
 *
 * This probe makes it happen every time: threads that each take a dynamic TLS block of
 * dtls_module.so (ASan hands every thread its first chunk of that size class at offset 16 of a
 * page), alive when the leak check runs at exit. It exits 0 only if the leak check survives;
 * it fails, saying so, if no block landed at the offset (then it would test nothing). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

enum { kThreads = 16 };
static char* (*touch)(void);
static pthread_barrier_t ready;
static int at_offset = 0;

static void* worker(void* arg) {
  const char* block = touch();
  if ((uintptr_t)block % 4096 == 16) __atomic_add_fetch(&at_offset, 1, __ATOMIC_RELAXED);
  pthread_barrier_wait(&ready);
  for (;;) pause(); /* alive during the leak check at exit */
  return arg;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: dtls_probe PATH/dtls_module.so\n");
    return 2;
  }
  void* module = dlopen(argv[1], RTLD_NOW);
  if (!module) {
    fprintf(stderr, "dtls_probe: %s\n", dlerror());
    return 2;
  }
  touch = (char* (*)(void))dlsym(module, "dtls_touch");
  if (!touch) {
    fprintf(stderr, "dtls_probe: %s has no dtls_touch\n", argv[1]);
    return 2;
  }
  pthread_barrier_init(&ready, NULL, kThreads + 1);
  for (int i = 0; i < kThreads; ++i) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) {
      fprintf(stderr, "dtls_probe: pthread_create failed\n");
      return 2;
    }
  }
  pthread_barrier_wait(&ready);
  printf("dtls_probe: %d of %d threads' dynamic TLS blocks at 16 mod 4096\n", at_offset, kThreads);
  fflush(stdout);
  if (at_offset == 0) {
    fprintf(stderr,
            "dtls_probe: no dynamic TLS block landed at 16 mod 4096, so this run tests nothing; "
            "the allocator's layout changed: adjust dtls_module.c's block size\n");
    return 1;
  }
  return 0; /* the leak check runs now, with the threads and their blocks alive */
}
