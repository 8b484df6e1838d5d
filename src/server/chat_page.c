/* chat_page.c - placeholder, replaced below */
const char ms_chat_page_html[] = "<!doctype html><title>moeserve</title>";
