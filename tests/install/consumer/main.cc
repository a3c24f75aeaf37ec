// Calls the installed C API: its version, its settings, and a refused client (a clear error).
#include <paramserver/paramserver_c.h>

#include <cstdio>

int main() {
  std::printf("api version %d\n", ps_api_version());
  std::printf("settings %s\n", ps_setting_names());
  ps_client* client = nullptr;
  const int code = ps_client_create("not json", &client);
  std::printf("refused with %d: %s\n", code, ps_last_error());
  return code != 0 && client == nullptr ? 0 : 1;
}
