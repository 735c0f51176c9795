"""`sagemaker_http`: the strict HTTP/1.1 layer each image copies beside its server, and the local router imports."""
